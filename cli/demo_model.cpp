// The cached demo model (see demo_model.hpp).
#include "cli/demo_model.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "model/make_model.hpp"

namespace fs = std::filesystem;

namespace sy::cli {

// Cached per user under $XDG_CACHE_HOME (or ~/.cache); rebuilt if the file is missing.
std::string demo_model_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path dir = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  dir /= "switchyard";
  fs::create_directories(dir);
  fs::path path = dir / "demo-15M-q8_0-seed1.gguf";
  std::cerr << "switchyard: no --model given: using the demo model " << path.string()
            << " (random weights, 15M Llama shape; its text is noise — pass --model FILE.gguf)\n";
  if (!fs::exists(path)) {
    sy::MakeModelOptions o;
    o.shape = "15M";
    o.dtype = "q8_0";
    o.seed = 1;
    // Written beside the target and renamed, so an interrupted run never leaves a torn file.
    // The process id keeps two first runs at once from writing the same temp file.
    fs::path tmp = path;
    tmp += ".tmp" + std::to_string(::getpid());
    o.out = tmp.string();
    sy::make_model(o);
    fs::rename(tmp, path);
  }
  return path.string();
}

}  // namespace sy::cli
