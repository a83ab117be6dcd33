"""Releasing a run: what `rcpipe version`, the nightly flow's versioning and the champion
app share. The rules (rules.py: what to commit, the gate's decision, a night's cost), the
DVC remote's records and git (remote.py), the champion record (record.py) and its GTO git
mirror (champions.py), the champion gate's set and answers (gate.py), a night's promotion
through the gate and the record's compare-and-swap (promotion.py), the nights page
(nights.py). The commands that use them are stages/version.py (`rcpipe version`) and
stages/registry.py (`rcpipe champion`); the Prefect task around the first,
flows/version.py."""
