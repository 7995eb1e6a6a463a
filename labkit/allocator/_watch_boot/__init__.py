"""The folder ``labkit watch`` puts first on PYTHONPATH: its ``sitecustomize`` hooks ``import torch``."""
