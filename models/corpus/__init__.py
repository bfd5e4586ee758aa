"""Corpus mode: per-head (and per-expert) statistics over thousands of documents, persisted and resumable.

``readers`` (bundled corpora, uploads, folders) → ``statistics.StatisticsRunner`` (the per-document function) run by
``engine.run_corpus`` (in process or Ray Data) into a ``store.ResultStore`` (Parquet) → ``analysis`` (summary with
spread, top examples, A→B search, the joint query–key embedding). DESIGN.md, "Beyond one input".
"""
