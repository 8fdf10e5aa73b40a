"""Scoring: the Scorer (a model, a task, an engine, a metric and batching together), the engines (teacher forcing,
generation), prompt encoding and context-window checks, prefix sharing, item spans and attention, chat templates,
and the split of rows across processes. The pipelines above it (eval/: sweep, compare, grid, show, cost, judging,
long context) run it; it knows no run folder of theirs."""
