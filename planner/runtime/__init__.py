"""The torch.distributed runtime and its launcher (needs the [runtime] extra)."""
