"""One tool call written twice, by plain greedy decoding and by oospec's `toolspec` drafter, and the check that the
token ids are the same.

    python examples/quickstart.py                        # Qwen2.5-Coder-1.5B-Instruct (fetched on first use)
    python examples/quickstart.py --model smollm2-135m   # the tiny model: seconds, but it writes no real call
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oospec import Engine
from oospec.drafters import make_drafter

HERE = Path(__file__).parent


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="known model name or Hugging Face folder")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)

    messages = json.loads((HERE / "messages.json").read_text())
    tools = json.loads((HERE / "tools.json").read_text())
    engine = Engine.from_pretrained(args.model)

    plain = engine.generate(messages, tools=tools, max_new_tokens=args.max_new_tokens)  # no drafter: plain greedy
    fast = engine.generate(messages, tools=tools, drafter=make_drafter("toolspec"), max_new_tokens=args.max_new_tokens)

    identical = plain.tokens.tolist() == fast.tokens.tolist()
    print(fast.text)
    for name, result in (("plain greedy", plain), ("toolspec", fast)):
        s = result.stats
        print(f"{name:12}  {s.new_tokens} tokens in {s.target_forwards} target forwards (tau {s.tau:.2f}), "
              f"decode {s.decode_s:.2f} s")
    print("token ids identical:", identical)
    return {"identical": identical, "plain": plain, "toolspec": fast}


if __name__ == "__main__":
    main()
