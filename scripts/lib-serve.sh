# Sourced by scripts that start `meshtrain serve --port 0` with its stderr in a log file.
# serve_wait_port LOG [SECONDS]: prints the port the server announced in LOG once /health answers
# there, or nothing when it has not within SECONDS (default 20).
serve_wait_port() {
  local log="$1" tries=$(( ${2:-20} * 5 )) port=""
  for _ in $(seq "$tries"); do
    port=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log")
    if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
      echo "$port"
      return 0
    fi
    sleep 0.2
  done
  return 1
}
