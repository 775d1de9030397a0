"""Llama slices: the six checks run over them through the common suites (they are cards tagged
`llama`); this file adds executorch's Meta llama lowering path, which must also give one partition."""

from harness.check_registry import suite_test

test_meta_llama_partitions = suite_test("meta_llama_partitions")
