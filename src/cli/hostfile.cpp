// DeepSpeed hostfile parsing and --include/--exclude filtering (see hostfile.h).
#include "cli/hostfile.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"

namespace mt::cli {
namespace {

// A positive decimal integer no larger than 1'000'000, else -1.
int parse_count(const std::string& s) {
  if (s.empty() || s.size() > 7) return -1;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v >= 1 && v <= 1000000 ? v : -1;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

}  // namespace

std::vector<HostSlots> hostfile_parse(const std::string& text, const std::string& where) {
  std::vector<HostSlots> hosts;
  std::map<std::string, int> seen;  // host -> line
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string at = where;
    at += ':';
    at += std::to_string(lineno);
    at += ": ";
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string t; words >> t;) w.push_back(t);
    if (w.empty()) continue;
    MT_CHECK(w.size() >= 2 && w[1].rfind("slots=", 0) == 0, ErrorKind::kInvalidArgument,
             at + "expected `hostname slots=N`, got `" + line + "`");
    MT_CHECK(w[0].find_first_of(",:") == std::string::npos, ErrorKind::kInvalidArgument,
             at + "host name `" + w[0] + "` holds ',' or ':', which separate hosts and slots for mpirun");
    int slots = parse_count(w[1].substr(6));
    MT_CHECK(slots > 0, ErrorKind::kInvalidArgument, at + w[1] + ": slots must be a whole number from 1 to 1000000");
    auto [it, fresh] = seen.emplace(w[0], lineno);
    MT_CHECK(fresh, ErrorKind::kInvalidArgument,
             at + "host " + w[0] + " is already listed on line " + std::to_string(it->second));
    hosts.push_back({w[0], slots, {}});
  }
  return hosts;
}

std::vector<HostSlots> hostfile_filter(const std::vector<HostSlots>& hosts, const std::string& include,
                                       const std::string& exclude) {
  MT_CHECK(include.empty() || exclude.empty(), ErrorKind::kInvalidArgument,
           "--include and --exclude are mutually exclusive");
  if (include.empty() && exclude.empty()) return hosts;
  const bool inc = !include.empty();
  const std::string flag = inc ? "--include" : "--exclude";
  // host -> selected slot indices (empty set: the whole host).
  std::map<std::string, std::set<int>> sel;
  for (const std::string& part : split(inc ? include : exclude, '@')) {
    auto colon = part.find(':');
    std::string host = part.substr(0, colon);
    MT_CHECK(!host.empty(), ErrorKind::kInvalidArgument, flag + " " + (inc ? include : exclude) + ": empty host name");
    const HostSlots* h = nullptr;
    for (const auto& x : hosts)
      if (x.host == host) h = &x;
    MT_CHECK(h, ErrorKind::kInvalidArgument, flag + ": host " + host + " is not among the hosts");
    std::set<int>& slots = sel[host];
    if (colon == std::string::npos) continue;
    for (const std::string& idx : split(part.substr(colon + 1), ',')) {
      int i = idx == "0" ? 0 : parse_count(idx);
      MT_CHECK(i >= 0 && i < h->slots, ErrorKind::kInvalidArgument,
               flag + ": " + host + ":" + idx + ": slot index must be in 0.." + std::to_string(h->slots - 1));
      slots.insert(i);
    }
  }
  std::vector<HostSlots> out;
  for (const auto& h : hosts) {
    auto it = sel.find(h.host);
    int n;
    if (inc)
      n = it == sel.end() ? 0 : it->second.empty() ? h.slots : static_cast<int>(it->second.size());
    else
      n = it == sel.end() ? h.slots : it->second.empty() ? 0 : h.slots - static_cast<int>(it->second.size());
    if (n <= 0) continue;
    HostSlots kept{h.host, n, {}};
    if (it != sel.end() && !it->second.empty()) {  // slot indices chosen: the ones kept, in order
      for (int i = 0; i < h.slots; ++i)
        if ((it->second.count(i) > 0) == inc) kept.ids.push_back(i);
    }
    out.push_back(kept);
  }
  return out;
}

std::string read_launcher_file(const std::string& path, const std::string& what) {
  struct stat st {};
  MT_CHECK(::stat(path.c_str(), &st) == 0, ErrorKind::kNotFound, path + ": cannot open the " + what + ": " + std::strerror(errno));
  MT_CHECK(S_ISREG(st.st_mode), ErrorKind::kInvalidArgument, path + ": the " + what + " is not a regular file");
  MT_CHECK(st.st_size <= (1 << 20), ErrorKind::kInvalidArgument, path + ": the " + what + " is over 1 MiB");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MT_CHECK(f, ErrorKind::kNotFound, path + ": cannot open the " + what + ": " + std::strerror(errno));
  std::string text;
  char buf[4096];
  for (size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  MT_CHECK(!failed, ErrorKind::kIOError, path + ": cannot read the " + what);
  return text;
}

}  // namespace mt::cli
