"""An OpenAI-compatible chat-completions server over one oospec engine (see `oospec serve --help`)."""
