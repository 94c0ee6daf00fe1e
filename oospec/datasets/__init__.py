"""Tool-calling benchmarks as chat samples: API-Bank (ToolSpec's preprocessing), BFCL v4 and ToolAlpaca.

Every loader returns ``Samples`` (a list of ``Sample``) whose ``messages`` go straight into
``tokenizer.apply_chat_template(messages, tools=sample.chat_tools(), add_generation_prompt=True)``; the
target's reply is a tool call in ``sample.dialect``. ``call_accuracy`` scores parsed calls the way each
benchmark does. The data ship inside the package (``oospec/data``, see its README for provenance and
licenses); ``load_path`` reads any other file in one of these formats. A malformed record is skipped with a
one-line warning (``logging``, logger ``oospec.datasets``) and counted in ``Samples.skipped``.

One module per format (``apibank``, ``bfcl``, ``toolalpaca``, ``generic``), ``accuracy``, ``sample`` (the
``Sample``, file access, skipping) and ``loader`` (by name or by file).
"""

from oospec.datasets.accuracy import call_accuracy, calls_match, normalize_value
from oospec.datasets.apibank import APIBANK_LEVELS, load_apibank, tools_from_apibank_prompt
from oospec.datasets.bfcl import BFCL_SPLITS, BFCL_SYSTEM_PROMPT, bfcl_check, bfcl_gold, load_bfcl
from oospec.datasets.loader import DATASETS, detect_format, load_dataset, load_path
from oospec.datasets.sample import DatasetError, Sample, Samples, data_path, group_sessions
from oospec.datasets.toolalpaca import is_placeholder, load_toolalpaca, parse_toolalpaca_input, tools_from_toolalpaca

__all__ = [
    "APIBANK_LEVELS",
    "BFCL_SPLITS",
    "BFCL_SYSTEM_PROMPT",
    "DATASETS",
    "DatasetError",
    "Sample",
    "Samples",
    "bfcl_check",
    "bfcl_gold",
    "call_accuracy",
    "calls_match",
    "data_path",
    "detect_format",
    "group_sessions",
    "is_placeholder",
    "load_apibank",
    "load_bfcl",
    "load_dataset",
    "load_path",
    "load_toolalpaca",
    "normalize_value",
    "parse_toolalpaca_input",
    "tools_from_apibank_prompt",
    "tools_from_toolalpaca",
]
