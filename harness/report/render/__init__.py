"""A run's report views, rendered from its report documents (harness/report/document.py): JUnit, Markdown,
HTML with its charts, and the writer that puts them with report.json in each SoC's folder."""
