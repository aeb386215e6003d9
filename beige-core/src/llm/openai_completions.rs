//! OpenAI Chat Completions client (in progress).
