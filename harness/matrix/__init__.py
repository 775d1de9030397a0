"""The version matrix: one suite selection across executorch and QNN library releases, side by side."""
