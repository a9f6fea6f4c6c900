"""plugins/ holds only the AirflowPlugin: loading Airflow's plugins adds no stray top-level modules.

Airflow's plugin manager imports every .py file under the plugins folder as a top-level module, in
every Airflow process. When the library lived there, `kafka`, `config`, `dags`... appeared in
sys.modules beside the real `offsetlake` package, shadowing real packages of those names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support import REPO

LOAD_PLUGINS = """
import json, sys
before = set(sys.modules)
from airflow import plugins_manager
plugins_manager.ensure_plugins_loaded()
plugins, errors = plugins_manager._get_plugins()
new_top_level = sorted({name.split(".")[0] for name in set(sys.modules) - before})
from_plugins_folder = sorted(name for name, module in sys.modules.items()
                             if (getattr(module, "__file__", None) or "").startswith(sys.argv[1]))
print(json.dumps({"plugins": [p.name for p in plugins], "errors": errors, "new_top_level": new_top_level,
                  "from_plugins_folder": from_plugins_folder}))
"""


def test_loading_airflow_plugins_adds_only_the_offsetlake_plugin_module(airflow_db):
    plugins_dir = str(REPO / "plugins")
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": plugins_dir, "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False"}
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_PLUGINS, plugins_dir], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])

    assert "offsetlake" in loaded["plugins"] and loaded["errors"] == {}
    assert loaded["from_plugins_folder"] == ["offsetlake_plugin"]
    # The names the old layout leaked (each a module of the library) are not top-level modules now.
    leaked = {"kafka", "config", "dags", "ledger", "commit", "batch", "tasks", "reader", "formats", "files"}
    assert not leaked & set(loaded["new_top_level"]), loaded["new_top_level"]
    assert sorted(p.name for p in (REPO / "plugins").rglob("*.py")) == ["offsetlake_plugin.py"]
