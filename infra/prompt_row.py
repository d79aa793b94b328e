"""One input row as the request builder reads it: what to send (text, chat messages or token
ids), the row's own sampling and constraints, and the columns as given, for the output.

The reader (infra/prompts.py) has already validated the file; this is the typed form rows
travel in from the shard reader to the request, so a field the request path reads is a name
mypy checks, not a dict key a typo turns into a silent None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.prompts import CONSTRAINT_COLUMNS, SAMPLING_COLUMNS


@dataclass(frozen=True)
class PromptRow:
    """One prompt. Exactly one of `prompt`, `messages` and `input_ids` is set (a primer,
    which carries a shared prefix and no id of the job, has `id` None)."""

    id: str | int | None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    input_ids: list[int] | None = None
    # the row's own sampling, over the job's (None: the job's)
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    # constraints: stop strings and SGLang's constrained decoding
    stop: str | list[str] | None = None
    json_schema: str | dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    # every input column as read, the user's own included: what the output row carries (a
    # row built in code, not read, carries its id and the fields it sets)
    columns: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.columns:
            given = {name: getattr(self, name) for name in self.__dataclass_fields__
                     if name != "columns"}
            object.__setattr__(self, "columns", {
                k: v for k, v in given.items() if v is not None or k == "id"})

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> PromptRow:
        """The row a reader gives (column name → value)."""
        known = {name: columns.get(name) for name in
                 ("prompt", "messages", "input_ids", *SAMPLING_COLUMNS, *CONSTRAINT_COLUMNS)}
        return cls(id=columns.get("id"), columns=columns, **known)  # the reader's own dict

    @property
    def constrained(self) -> bool:
        """Whether a grammar (schema, regex, EBNF) decides where the answer ends."""
        return any(c is not None for c in (self.json_schema, self.regex, self.ebnf))

    def sampling_overrides(self) -> dict[str, Any]:
        """The row's own sampling columns that are set."""
        given = {name: getattr(self, name) for name in SAMPLING_COLUMNS}
        return {k: v for k, v in given.items() if v is not None}

    def grammar(self) -> dict[str, str]:
        """regex / ebnf as SGLang names them, where set."""
        return {k: v for k, v in (("regex", self.regex), ("ebnf", self.ebnf)) if v is not None}
