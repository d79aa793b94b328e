"""OpenAI batch-API input rows (`custom_id`, `method`, `url`, `body`) read as the pipeline's
own columns, or refused: a field this pipeline would not honour is an error naming it, never
dropped in silence (a `body.n` of 2 gave one answer per row, a `body.stop` was not applied,
`"url": "/v1/embeddings"` ran as chat).

Honoured: `body.messages`, `max_tokens` (or `max_completion_tokens`), `temperature`, `top_p`,
`seed`, `stop`, `n` of 1; `model` names the deployment in OpenAI's API and is not per row here
(the job's model answers every row).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

CHAT_URL = "/v1/chat/completions"
SAMPLING = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
            "temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop"}
IGNORED_ON_PURPOSE = {"model", "messages", "n"}
ADVICE = {
    "response_format": "give the schema as a `json_schema` column in the pipeline's own JSONL "
                       "(id, messages, json_schema)",
    "stream": "batch answers are not streamed; remove it",
}


class BatchInputError(ValueError):
    """Raised with the message infra.prompts turns into its InputError."""


def batch_columns(lf: pl.LazyFrame, path: Path) -> list[pl.Expr]:
    """The select that maps batch rows onto id, messages and the sampling columns."""
    schema = lf.collect_schema()
    if "url" in schema.names():
        urls = lf.select(pl.col("url").unique()).collect()["url"].to_list()
        other = sorted(str(u) for u in urls if u != CHAT_URL)
        if other:
            raise BatchInputError(f"prompts: {path}: `url` {other[0]}: only {CHAT_URL} rows "
                                  "are generated here; remove the others or split the file")
    fields = {f.name for f in getattr(schema["body"], "fields", [])}
    if "messages" not in fields:
        raise BatchInputError(f"prompts: {path}: OpenAI batch rows need body.messages")
    unknown = sorted(fields - set(SAMPLING) - IGNORED_ON_PURPOSE)
    if unknown:
        name = unknown[0]
        fix = ADVICE.get(name, "remove it (it would be ignored)")
        raise BatchInputError(f"prompts: {path}: body.{name} is not supported here; {fix}")
    body = pl.col("body")
    if "n" in fields:
        most = lf.select(body.struct.field("n").max()).collect().item()
        if most is not None and int(most) > 1:
            raise BatchInputError(f"prompts: {path}: body.n is {most}: a job asks every row "
                                  "for the same number of answers; drop body.n and set "
                                  f"`sampling.n` ({'--set sampling.n=' + str(most)})")
    exprs = [pl.col("custom_id").cast(pl.String).alias("id"),
             body.struct.field("messages").alias("messages")]
    taken: set[str] = set()
    for source, column in SAMPLING.items():
        if source in fields and column not in taken:
            taken.add(column)
            exprs.append(body.struct.field(source).alias(column))
    return exprs
