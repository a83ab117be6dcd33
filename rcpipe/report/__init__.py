"""The evaluation report and the attention views: tables, plots, pages, explain (no file I/O)."""
