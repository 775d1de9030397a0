"""The version matrix (issue 16): one suite selection across executorch and QNN library releases, side by side."""
