// The server summary of the stats records as JSON (see stats.hpp): one renderer for the
// `ctl stats` reply and the SIGUSR1 line.
#include "actors/stats.hpp"

#include <nlohmann/json.hpp>

namespace sy {
namespace {

using Json = nlohmann::ordered_json;

// `j` as text with ", " and ": " between items, the layout the stats replies have always had
// (nlohmann's dump() writes either no spaces or one item per line). Scalars, keys and escaping
// are nlohmann's.
void write_spaced(const Json& j, std::string& out) {
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      if (!first) out += ", ";
      first = false;
      out += Json(k).dump();
      out += ": ";
      write_spaced(v, out);
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += ", ";
      write_spaced(j[i], out);
    }
    out += ']';
  } else {
    out += j.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

}  // namespace

std::string summary_json(const AdmissionStats& admission, const RouterStats& router,
                         const BatcherStats& batchers, const EdgeStats& edge,
                         const SupervisorStats* supervisor, const JournalStats* journal,
                         const std::vector<BatcherStats>* per_batcher) {
  Json o = Json::object();
  for_each_summary_field(admission, router, batchers, edge, supervisor, journal,
                         [&](const std::string& name, int64_t v) { o[name] = v; });
  if (per_batcher) {
    Json arr = Json::array();
    for (const BatcherStats& b : *per_batcher) {
      Json bo = Json::object();
      for_each_field(b, [&](const auto& fl) {
        if (fl.show & stats_fields::kPerBatcher) bo[fl.name] = fl.value;
      });
      arr.push_back(std::move(bo));
    }
    o["batchers"] = std::move(arr);
  }
  std::string out;
  write_spaced(o, out);
  return out;
}

}  // namespace sy
