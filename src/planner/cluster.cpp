#include "planner/cluster.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/text.h"

namespace mt::planner {
namespace {

// A figure of a device or link, in the units its key names: from 1e-6 to 1e6 (1e-300 GB/s priced a
// step at 4e300 s, 1e300 GFLOP of half efficiency deadlocked the simulator's clock; both exit 0).
double positive(const nlohmann::json& j, const std::string& key, const std::string& where) {
  MT_CHECK(j.is_object() && j.contains(key) && j[key].is_number() && j[key].get<double>() >= 1e-6 && j[key].get<double>() <= 1e6,
           ErrorKind::kInvalidArgument, where + ": '" + key + "' must be a positive number, from 1e-6 to 1e6");
  return j[key].get<double>();
}
const nlohmann::json& object(const nlohmann::json& j, const std::string& key, const std::string& where) {
  MT_CHECK(j.is_object() && j.contains(key) && j[key].is_object(), ErrorKind::kInvalidArgument,
           where + ": '" + key + "' must be an object");
  return j[key];
}

// A key the description does not have is refused, with the nearest it has: a misspelt figure
// (intra_host.latncy_us, peak_tflops.fp16) was ignored and the shipped one's absence refused at
// best, or the key silently did nothing beside the real one.
void refuse_unknown(const nlohmann::json& j, const std::vector<std::string>& known, const std::string& where) {
  for (const auto& [k, v] : j.items()) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    std::string best;
    int best_d = 3;
    for (const std::string& c : known)
      if (const int d = edit_distance(k, c); d < best_d) best_d = d, best = c;
    throw Error(ErrorKind::kInvalidArgument, where + ": '" + k + "' is not a key of a cluster description" +
                                                 (best.empty() ? "" : " (did you mean '" + best + "'?)"));
  }
}

}  // namespace

ClusterSpec parse_cluster(const nlohmann::json& j, const std::string& where) {
  MT_CHECK(j.is_object(), ErrorKind::kInvalidArgument, where + ": a cluster description is a JSON object");
  refuse_unknown(j,
                 {"name", "sources", "devices_per_host", "memory_gib", "peak_tflops", "gemm", "attention_efficiency", "memory_gbs",
                  "memory_efficiency", "intra_host", "inter_host", "link_efficiency"},
                 where);
  for (const auto& [block, keys] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"peak_tflops", {"bf16", "f32"}},
           {"gemm", {"efficiency", "half_efficiency_gflop"}},
           {"intra_host", {"gbs", "latency_us"}},
           {"inter_host", {"gbs", "latency_us"}}})
    if (j.contains(block) && j[block].is_object()) refuse_unknown(j[block], keys, where + " " + block);
  ClusterSpec c;
  MT_CHECK(!j.contains("name") || j["name"].is_string(), ErrorKind::kInvalidArgument, where + ": 'name' must be a string");
  c.name = j.value("name", where);
  if (j.contains("sources") && j["sources"].is_array())
    for (const auto& s : j["sources"]) c.sources.push_back(s.is_string() ? s.get<std::string>() : s.dump());
  MT_CHECK(j.contains("devices_per_host") && j["devices_per_host"].is_number(), ErrorKind::kInvalidArgument,
           where + ": 'devices_per_host' must be a whole number of devices from 1 to 65536");
  const double devices = j["devices_per_host"].get<double>();  // 2.5 was read as 2, 1e12 overflowed int
  MT_CHECK(devices == std::floor(devices) && devices >= 1 && devices <= 65536, ErrorKind::kInvalidArgument,
           where + ": 'devices_per_host' must be a whole number of devices from 1 to 65536");
  c.devices_per_host = static_cast<int>(devices);
  // Every other figure: (enclosing object or "", key, field).
  const struct {
    const char* object;
    const char* key;
    double ClusterSpec::*field;
  } figures[] = {{"", "memory_gib", &ClusterSpec::memory_gib},
                 {"peak_tflops", "bf16", &ClusterSpec::peak_bf16_tflops},
                 {"peak_tflops", "f32", &ClusterSpec::peak_f32_tflops},
                 {"gemm", "efficiency", &ClusterSpec::gemm_efficiency},
                 {"gemm", "half_efficiency_gflop", &ClusterSpec::gemm_half_gflop},
                 {"", "attention_efficiency", &ClusterSpec::attention_efficiency},
                 {"", "memory_gbs", &ClusterSpec::memory_gbs},
                 {"", "memory_efficiency", &ClusterSpec::memory_efficiency},
                 {"intra_host", "gbs", &ClusterSpec::intra_gbs},
                 {"intra_host", "latency_us", &ClusterSpec::intra_latency_us},
                 {"inter_host", "gbs", &ClusterSpec::inter_gbs},
                 {"inter_host", "latency_us", &ClusterSpec::inter_latency_us},
                 {"", "link_efficiency", &ClusterSpec::link_efficiency}};
  for (const auto& f : figures) {
    const std::string obj = f.object;
    c.*f.field = obj.empty() ? positive(j, f.key, where) : positive(object(j, obj, where), f.key, where + " " + obj);
  }
  for (const auto& [key, e] : {std::pair<const char*, double>{"gemm.efficiency", c.gemm_efficiency},
                               {"attention_efficiency", c.attention_efficiency},
                               {"memory_efficiency", c.memory_efficiency},
                               {"link_efficiency", c.link_efficiency}})
    MT_CHECK(e <= 1.0, ErrorKind::kInvalidArgument,
             where + ": '" + key + "' is " + nlohmann::json(e).dump() + "; an efficiency is a fraction of the peak (at most 1)");
  return c;
}

Calibration cluster_calibration(const ClusterSpec& c) {
  Calibration cal;
  cal.world = c.devices_per_host;
  cal.threads = 0;  // devices, not CPU threads
  auto gemm_line = [&](double peak_tflops) {
    const double rate = peak_tflops * 1e12 * c.gemm_efficiency;  // flop/s of a large GEMM
    return LinearFit{c.gemm_half_gflop * 1e9 / rate, 1.0 / rate};
  };
  cal.fits["gemm bf16"] = gemm_line(c.peak_bf16_tflops);
  cal.fits["gemm f32"] = gemm_line(c.peak_f32_tflops);
  const double att = 1.0 / (c.peak_bf16_tflops * 1e12 * c.attention_efficiency);
  cal.fits["attention forward"] = LinearFit{0.0, att};
  cal.fits["attention backward"] = LinearFit{0.0, 2.0 * att};  // twice the forward's FLOPs
  const double per_byte = 1.0 / (c.memory_gbs * 1e9 * c.memory_efficiency);
  cal.fits["memory"] = LinearFit{0.0, per_byte};
  // AdamW an element: master, gradient and both moments read (16 bytes), master and moments
  // written (12); with the bf16 copy 2 more.
  cal.fits["adamw"] = LinearFit{0.0, 28.0 * per_byte};
  cal.fits["adamw bf16"] = LinearFit{0.0, 30.0 * per_byte};
  cal.has_network = true;
  cal.network.devices_per_host = c.devices_per_host;
  cal.network.intra_latency = c.intra_latency_us * 1e-6;
  cal.network.intra_bytes_per_s = c.intra_gbs * 1e9 * c.link_efficiency;
  cal.network.inter_latency = c.inter_latency_us * 1e-6;
  cal.network.inter_bytes_per_s = c.inter_gbs * 1e9 * c.link_efficiency;
  return cal;
}

}  // namespace mt::planner
