"""benchmarks/coverage.py: the families issue 26 tried are in the benchmark, and findings located
outside the model's file and its layers' libraries are counted."""
from benchmarks import coverage

ISSUE_26 = ["resnext50_32x4d", "fasterrcnn_resnet50_fpn", "timm/eva02_tiny_patch14_224", "timm/fastvit_t8",
            "timm/efficientvit_b0", "timm/maxvit_nano_rw_256", "timm/nf_resnet26", "hf/qwen2", "hf/mistral",
            "hf/gemma2", "hf/phi3", "hf/mixtral", "hf/mamba", "hf/dinov2", "hf/wav2vec2", "hf/detr", "hf/segformer"]


def test_the_issue_families_have_model_files():
    for name in ISSUE_26:
        suite, _, source = coverage.model_file(name, 128)
        assert "model =" in source and suite in ("torchvision", "timm", "hf")
    assert set(ISSUE_26) - {"fasterrcnn_resnet50_fpn", "hf/mixtral", "hf/wav2vec2", "hf/detr"} <= set(coverage.REPRESENTATIVE)


def test_misplaced_findings_are_those_outside_the_model_file_and_its_libraries():
    report = {"model": "hf__gemma2.py:model", "findings": [
        {"location": {"path": "hf__gemma2.py", "line": 4}},
        {"location": {"path": "transformers/models/gemma2/modeling_gemma2.py", "line": 9, "library": True}},
        {"location": {"path": "../../bin/preclint", "line": 8}},  # the launcher: sys.exit(main())
        {"location": {"path": "preclint/capture/fx_capture.py", "line": 3, "library": True}},
        {"location": None},
    ]}
    assert coverage.misplaced_findings(report) == 2
