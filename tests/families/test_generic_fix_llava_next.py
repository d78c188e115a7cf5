"""mlx-vlm 0.7.10's LLaVA-NeXT merge (``fixes/llava_next.py``): no anyres packing, one image token per image. The
sweep's run shows the decoder's first stage with more rows than the prompt right after stages that all agree; the
merge patch closes it, and the text MLP's SwiGLU (``fixes/llava.py``) shows next; ``llava_next_fixes`` closes both."""

from __future__ import annotations

from generic_fix_support import conclusion, first_divergence, rows, sweep_run


def test_the_merge_is_localized_before_the_decoder_and_closed_then_the_text_mlp(tmp_path):
    report = sweep_run("llava_next", tmp_path / "as-is")
    assert first_divergence(report) == "text.layer.0.input_layernorm"
    row = rows(report)["text.layer.0.input_layernorm"]
    assert row["status"] == "shape_mismatch" and row["candidate_shape"][0] > row["reference_shape"][0]
    assert row["reference_shape"][0] == report.data["inputs"]["text"]["tokens"]  # the reference's rows: the prompt
    said = conclusion(report)
    assert said["kind"] == "unreplayed" and said["agrees"] == "text.embed_tokens"  # the prompt's own rows agree
    assert said["ready_patches"][0] == "driftscope.hypotheses:llava_next_anyres_merge"

    merged = sweep_run("llava_next", tmp_path / "merged", mlx="llava_next_anyres_merge")
    assert rows(merged)["text.layer.0.input_layernorm"]["status"] == "pass"
    assert first_divergence(merged).startswith("text.layer.0.mlp.")
    assert conclusion(merged)["ready_patches"] == ["driftscope.hypotheses:llava_next_fixes"]

    both = sweep_run("llava_next", tmp_path / "both", mlx="llava_next_fixes")
    assert both.data["verdict"]["status"] == "pass", both.data["verdict"]["reasons"]
