// meshtrain plot METRICS [-o OUT]: the loss curve of a `train --metrics` file (training loss per
// step, validation loss where it was measured, learning rate on a second axis), drawn by gnuplot
// (Debian's gnuplot-nox) as PNG or SVG by OUT's extension. `train --metrics F` draws F's stem .png
// at the end of a run when gnuplot is installed.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/signals.h"
#include "cli/commands.h"

namespace mt::cli {
namespace fs = std::filesystem;
namespace {

bool have_gnuplot() { return system_as_started("command -v gnuplot > /dev/null 2>&1") == 0; }

// gnuplot string literal: single quotes, a quote doubled.
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

bool plot_metrics(const std::string& metrics, const std::string& out, bool required) {
  if (!have_gnuplot()) {
    MT_CHECK(!required, ErrorKind::kNotFound, "plot: gnuplot is not installed (apt-get install gnuplot-nox)");
    std::fprintf(stderr, "note: no loss-curve plot (gnuplot is not installed: apt-get install gnuplot-nox)\n");
    return false;
  }
  std::ifstream in(metrics);
  MT_CHECK(in.good(), ErrorKind::kNotFound, metrics + ": cannot open");
  // The output's checks first, and the two work files removed however this ends (a refused input
  // left OUT.dat behind; a directory that is not there had gnuplot read a script never written and
  // its raw wait status said, exit 1).
  const std::string ext = fs::path(out).extension().string();
  MT_CHECK(ext == ".png" || ext == ".svg", ErrorKind::kInvalidArgument, out + ": the plot must be a .png or .svg file");
  {
    std::error_code ec;
    const fs::path parent = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : fs::path(".");
    MT_CHECK(fs::is_directory(parent, ec), ErrorKind::kInvalidArgument, out + ": " + parent.string() + " is not a directory");
  }
  std::string data = out + ".dat", script = out + ".gp", log = out + ".log";
  struct Remove {
    std::string a, b, c;
    ~Remove() {
      std::error_code ec;
      fs::remove(a, ec);
      fs::remove(b, ec);
      fs::remove(c, ec);
    }
  } remove{data, script, log};
  std::ofstream d(data);
  MT_CHECK(d.good(), ErrorKind::kIOError, data + ": cannot write");
  std::string line;
  size_t line_no = 0, rows = 0, vals = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      // The last line of a run still writing it is cut short (train reads it so too): skipped.
      if (in.eof()) {
        std::fprintf(stderr, "warning: %s:%zu: a line cut short (a run still writing it?), not plotted\n", metrics.c_str(), line_no);
        break;
      }
      throw Error(ErrorKind::kInvalidArgument, metrics + ":" + std::to_string(line_no) + ": not valid JSON");
    }
    // A step whose loss was not finite is written null: a gap in the curve (it stopped the plot).
    MT_CHECK(j.is_object() && j.contains("step") && j.contains("loss") && j["step"].is_number() &&
                 (j["loss"].is_number() || j["loss"].is_null()),
             ErrorKind::kInvalidArgument, metrics + ":" + std::to_string(line_no) + ": expected \"step\" and \"loss\" numbers");
    // A null val_loss or lr (a step without them) is absent; another type is said with its line
    // (nlohmann's type_error was said without it).
    const bool val = j.contains("val_loss") && !j["val_loss"].is_null(), lr = j.contains("lr") && !j["lr"].is_null();
    MT_CHECK((!val || j["val_loss"].is_number()) && (!lr || j["lr"].is_number()), ErrorKind::kInvalidArgument,
             metrics + ":" + std::to_string(line_no) + ": \"val_loss\" and \"lr\" must be numbers");
    d << j["step"].get<double>() << '\t';
    if (j["loss"].is_null())
      d << "NaN";
    else
      d << j["loss"].get<double>();
    d << '\t'
      << (val ? std::to_string(j["val_loss"].get<double>()) : std::string("NaN")) << '\t'
      << (lr ? j["lr"].get<double>() : 0.0) << '\n';
    ++rows;
    vals += val;
  }
  d.close();
  MT_CHECK(!d.fail(), ErrorKind::kIOError, data + ": cannot write");
  MT_CHECK(rows > 0, ErrorKind::kInvalidArgument, metrics + ": no steps to plot");
  std::ofstream g(script);
  g << (ext == ".png" ? "set terminal pngcairo size 1000,560 noenhanced\n" : "set terminal svg size 1000,560 noenhanced\n")
    << "set output " << gp_quote(out) << "\n"
    << "set title " << gp_quote("meshtrain: " + fs::path(metrics).filename().string()) << "\n"
    << "set xlabel 'step'\nset ylabel 'loss (nats/token)'\nset y2label 'learning rate'\n"
    << "set ytics nomirror\nset y2tics\nset y2range [0:*]\nset grid\nset key top right\nset datafile missing 'NaN'\n"
    << "plot " << gp_quote(data) << " using 1:2 with lines lw 1.5 title 'train loss'";
  if (vals > 0) g << ", " << gp_quote(data) << " using 1:3 with linespoints pt 7 lw 2 title 'validation loss'";
  g << ", " << gp_quote(data) << " using 1:4 axes x1y2 with lines dt 2 title 'lr'\n";
  g.close();
  MT_CHECK(!g.fail(), ErrorKind::kIOError, script + ": cannot write");
  // The script's path in shell quotes (gnuplot's doubled quote broke a path with an apostrophe);
  // gnuplot's own lines kept aside: its "empty y range" warnings of a one-step curve were noise,
  // and a failure says its first line.
  auto shell_quote = [](const std::string& t) {
    std::string q = "'";
    for (char c : t) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const int rc = system_as_started("gnuplot " + shell_quote(script) + " > " + shell_quote(log) + " 2>&1");
  const int code = rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : rc;  // (the raw wait status was said: "exit 256")
  if (rc != 0 || !fs::exists(out)) {
    std::ifstream l(log);
    std::string first, said;
    while (said.empty() && std::getline(l, first))
      if (first.find_first_not_of(" \t\r") != std::string::npos) said = first;
    throw Error(ErrorKind::kIOError, out + ": gnuplot failed (exit " + std::to_string(code) + ")" + (said.empty() ? "" : ": " + said));
  }
  return true;
}

void register_plot(CLI::App& app) {
  auto metrics = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("plot", "Draw the loss curve of a --metrics file (gnuplot: PNG or SVG)");
  cmd->add_option("METRICS", *metrics, "a file written by train --metrics")->required();
  cmd->add_option("-o,--output", *out, "output .png or .svg (default: METRICS with .png)");
  cmd->callback([metrics, out] {
    std::string o = out->empty() ? fs::path(*metrics).replace_extension(".png").string() : *out;
    plot_metrics(*metrics, o, true);
    std::printf("loss curve: %s\n", o.c_str());
  });
}

}  // namespace mt::cli
