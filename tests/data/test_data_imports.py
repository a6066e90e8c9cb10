"""The data package is host-side: importing it (traces included) must not import JAX."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_data_imports_no_jax():
    code = ("import sys, rstar2_jax.data, rstar2_jax.data.sft_traces; "
            "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax'))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_make_sft_traces_script_writes_loadable_jsonl(tmp_path):
    from rstar2_jax.data.chat import load_chat_jsonl
    from rstar2_jax.rollout.template import TemplateConfig

    out = tmp_path / "traces.jsonl"
    proc = subprocess.run([sys.executable, "experiments/make_sft_traces.py", "--n", "12", "--seed", "3",
                           "--p-error-retry", "0.5", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    assert "wrote 12 traces" in proc.stdout
    records = load_chat_jsonl(out, template_cfg=TemplateConfig.toy())
    assert len(records) == 12 and {r["meta"]["variant"] for r in records} <= {"clean", "error_retry", "no_tool"}
