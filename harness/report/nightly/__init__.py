"""The tools a nightly runs on report folders after the runs: merge shards into one run, promote a run into
the nightly store, the store's history, and one upstream issue per finding. They read reports only through
harness/report/intake.py and render through harness/report/render/."""
