"""Configs: a YAML file checked against a schema, and what it describes built from it.

``schema`` (every key: its check, default and docstring in one place), ``yaml_source`` (YAML that
remembers where each value came from), ``load`` (``load_config``: validation, defaults, overrides,
error positions) and ``build`` (a net, a policy, a pool size and a cost model from a config).
"""
from .load import Config, ConfigDumper, config_error_line, load_config

__all__ = ["Config", "ConfigDumper", "config_error_line", "load_config"]
