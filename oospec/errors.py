"""Errors a user can act on. Everything the CLI shows without a traceback derives from OospecError."""


class OospecError(Exception):
    """Base class: the message alone tells the user what went wrong and what to do."""


class ModelNotFoundError(OospecError):
    """A model name that is neither a known model nor a local Hugging Face folder."""


class ModelIntegrityError(OospecError):
    """Downloaded or cached weights that are corrupt, truncated or fail their checksum."""


class ContextLengthError(OospecError):
    """A prompt (plus the requested new tokens) that does not fit the model's context."""


class InvalidMessagesError(OospecError):
    """Chat messages that are not a list of {role, content} objects the chat template accepts."""


class ChatTemplateError(OospecError):
    """A chat template that cannot render what it was given (e.g. tools it ignores)."""


class SchemaError(OospecError):
    """A tool definition that cannot be turned into a schema."""


def did_you_mean(word: str, choices) -> str:
    """" (did you mean 'x'?)" for the closest of `choices` to a mistyped `word`, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(str(word).strip().lower(), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class MissingExtraError(OospecError):
    """An optional part of oospec whose packages are not installed."""


def optional_import(module: str, extra: str):
    """`module`, imported; MissingExtraError naming the pip extra that installs it where it is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(f"{module} is not installed: pip install 'oospec[{extra}]'") from None
