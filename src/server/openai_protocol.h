// The OpenAI / vLLM protocol layer, by job: request parsing (openai_request.h), one choice's output
// stream (choice_state.h) and response JSON (openai_response.h).
#pragma once
#include "server/choice_state.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
