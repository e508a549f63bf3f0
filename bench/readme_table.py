"""Regenerate README's "Measured speeds" table from the committed result files.

    python bench/readme_table.py          # rewrites the table between the README markers
    python bench/readme_table.py --check  # exit 1 when README is out of date (used by a test)

Only numbers present in `bench/results/*.json` reach the table; a missing file drops its rows.
A prefill-only run `NAME-prefill.json` beside `NAME.json` gives that shape's prefill row. The
rows of each area come from `bench/readme_rows/`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from readme_rows import cpu, decode, experts, prompt, serving  # (this folder is on sys.path)

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- speeds:begin -->", "<!-- speeds:end -->"


def table() -> str:
    head = "| what | ninfer | reference (same run) | ratio |\n|---|---:|---:|---:|\n"
    return head + "\n".join(
        cpu.cpu_rows() + cpu.cpu_short_prompt_rows() + cpu.cpu_ngram_rows() + decode.gpu_rows()
        + decode.lookahead_rows() + decode.gemv_split_rows() + prompt.prompt_activation_rows()
        + prompt.prompt_fp8_dense_rows() + prompt.moe_order_rows() + prompt.gdn_prompt_rows()
        + prompt.gdn_tiles_and_burst_rows() + decode.step_row_rows() + decode.verify_rows()
        + decode.llama_step_rows() + decode.policy_rows() + decode.mtp_rows() + cpu.mask_rows()
        + serving.engine_process_rows() + serving.served_rows() + cpu.agent_replay_rows()
        + serving.host_tier_rows() + experts.expert_offload_rows()) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = README.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    updated = text[:start] + "\n" + table() + text[end:]
    if args.check:
        return 0 if updated == text else 1
    README.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
