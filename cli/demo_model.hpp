// The demo model shared by the `switchyard` commands: a random-weight Llama written once and
// cached, so the quick start needs no download.
#pragma once

#include <string>

namespace sy::cli {

/// Path of the cached demo model (15M Llama shape, q8_0, seed 1), writing it first if missing.
/// Says on stderr that the demo model is in use and that its text is noise.
std::string demo_model_path();

}  // namespace sy::cli
