"""The pipeline as one table (stages.py), the code each stage runs (code.py), and dvc.yaml
made from both (dvc_yaml.py: `python -m rcpipe.pipeline.dvc_yaml` writes it)."""
