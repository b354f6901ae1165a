// The OpenAI HTTP API as plain code (openai.hpp).
#include "ingress/openai.hpp"
