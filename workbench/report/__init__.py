"""Notebook reports: run notebooks/*.py headless with papermill and render them into HTML.

``runner.run_report`` is the entry point behind ``python -m workbench report``; ``tables``,
``plots`` and ``analysis`` are the helpers notebooks call (notebooks define nothing themselves).
"""
