// The Batch API (http_batch.hpp).
#include "ingress/http_batch.hpp"
