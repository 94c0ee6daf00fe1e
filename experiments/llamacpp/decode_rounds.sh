#!/usr/bin/env bash
# Plain decoding per token beside llama.cpp on the same GGUF, in alternating rounds: this machine's speed drifts by
# several percent within minutes, so each round times llama.cpp and oospec back to back and the rounds' medians are
# compared, never one run against another made at a different time.
# Usage: experiments/llamacpp/decode_rounds.sh OUT [ROUNDS] [MODEL] [THREADS]
#   OUT/llama-R.json: llama-bench tg64 at depths 0 and 580 (an empty context, and the prompt oospec's curve has)
#   OUT/curve580-R.json, OUT/curve16-R.json: `oospec bench cost-curve` after a 580- and a 16-token prompt
#   OUT/busy1.json: the 580-token curve beside one busy loop, once at the end
# Then prints each round and the medians (SUMMARY_ONLY=1: only that, from files already in OUT).
# DTYPE (default auto) is oospec's --dtype; LLAMA_BENCH another llama-bench (experiments/llamacpp/build.sh's ISA=avx2
# peer beside OOSPEC_KERNEL_ISA=avx2 and DTYPE=float32: what an AVX2-only CPU runs).
set -euo pipefail
OUT=${1:?output folder}
ROUNDS=${2:-3}
MODEL=${3:-qwen2.5-coder-1.5b}
THREADS=${4:-2}
HOME_DIR=${OOSPEC_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/oospec}
BENCH=${LLAMA_BENCH:-$HOME_DIR/llamacpp/build/bin/llama-bench}
GGUF=${GGUF:-$HOME_DIR/gguf/$MODEL.gguf}
mkdir -p "$OUT"
[ -n "${SUMMARY_ONLY:-}" ] && ROUNDS=0
for r in $(seq 1 "$ROUNDS"); do
  "$BENCH" -m "$GGUF" -t "$THREADS" -p 0 -n 64 -d 0,580 -r 3 -o json > "$OUT/llama-$r.json"
  oospec bench cost-curve --model "$MODEL" --dtype "${DTYPE:-auto}" --ks 1,16,64 --repeats 9 --prompt-len 580 --threads "$THREADS" --out "$OUT/curve580-$r.json" > /dev/null
  oospec bench cost-curve --model "$MODEL" --dtype "${DTYPE:-auto}" --ks 1,16 --repeats 9 --prompt-len 16 --threads "$THREADS" --out "$OUT/curve16-$r.json" > /dev/null
done
[ "$ROUNDS" -gt 0 ] && oospec bench cost-curve --model "$MODEL" --dtype "${DTYPE:-auto}" --ks 1,16 --repeats 7 --prompt-len 580 --threads "$THREADS" --busy 1 --out "$OUT/busy1.json" > /dev/null
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
rows = {"llama.cpp tg64 @ d0": [], "llama.cpp tg64 @ d580": [], "oospec c(1), 16-token prompt": [],
        "oospec c(1), 580-token prompt": [], "oospec c(16)/c(1), 580": [], "oospec prefill 580, tokens/s": []}
for r in sorted(int(f.split("-")[-1][:-5]) for f in glob.glob(f"{out}/llama-*.json")):
    for t in json.load(open(f"{out}/llama-{r}.json")):
        rows[f"llama.cpp tg64 @ d{t['n_depth']}"].append(1000 / t["avg_ts"])
    c580, c16 = json.load(open(f"{out}/curve580-{r}.json")), json.load(open(f"{out}/curve16-{r}.json"))
    rows["oospec c(1), 16-token prompt"].append(1000 * c16["seconds"]["1"])
    rows["oospec c(1), 580-token prompt"].append(1000 * c580["seconds"]["1"])
    rows["oospec c(16)/c(1), 580"].append(c580["ratio"]["16"])
    rows["oospec prefill 580, tokens/s"].append(c580["prompt_len"] / c580["prefill_s"])
for name, values in rows.items():
    print(f"{name:32s} median {statistics.median(values):7.2f}   rounds " + " ".join(f"{v:.2f}" for v in values))
try:
    busy = json.load(open(f"{out}/busy1.json"))["seconds"]["1"] * 1000
    print(f"{'oospec c(1) beside a busy loop':32s} {busy:7.2f} ms ({busy / statistics.median(rows['oospec c(1), 580-token prompt']):.2f}x the quiet median)")
except FileNotFoundError:
    pass
PY
