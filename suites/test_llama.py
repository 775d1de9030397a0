"""Llama slices: the six checks run over them through the common suites (they are cards tagged
`llama`); this file adds executorch's Meta llama lowering path, which must also give one partition."""
from harness.checks import check_meta_llama_partitions


def test_meta_llama_partitions(meta_llama_case, run_check):
    run_check(check_meta_llama_partitions, meta_llama_case)
