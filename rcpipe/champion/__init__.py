"""The champion app: rcpipe.champion.app:champion_app (infra/serve/rcpipe.yaml)."""
