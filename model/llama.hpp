// The names of the time when only the `llama` architecture loaded (LlamaModel, LlamaConfig, ...):
// aliases of the model description in model/model.hpp.
#pragma once

#include "model/model.hpp"
