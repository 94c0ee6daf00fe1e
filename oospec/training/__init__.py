"""Training the sidecar once, with LoRA, on calls written by a larger teacher (`oospec sidecar ...`)."""
