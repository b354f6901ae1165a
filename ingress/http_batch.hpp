// The OpenAI Batch API (docs/http.md): placeholder until written.
#pragma once
