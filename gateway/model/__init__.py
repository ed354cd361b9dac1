"""The model side: the OpenAI-compatible provider, the bundled local model, the offline
tokenizer, per-session context sizing (window, history limit, budget) and the pluggable
context engines and summarizer."""
