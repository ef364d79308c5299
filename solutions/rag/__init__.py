"""RAG knowledge base: compliance redaction, sentence rules, answers with citations, metrics."""
