"""oospec's drafters as a vLLM speculative proposer (`speculative_config={"method": "custom_class", ...}`)."""
