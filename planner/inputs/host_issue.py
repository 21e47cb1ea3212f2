"""What issuing a block's kernels costs the host, per block, as ``plan calibrate`` measures it."""

from dataclasses import dataclass

__all__ = ["HostIssue", "HOST_ISSUE_KEYS"]

# A calibration's ``device_types.<type>.host_issue_s`` keys, in ``HostIssue``'s field order.
HOST_ISSUE_KEYS = ("forward", "forward_backward", "recomputed", "split")


@dataclass(frozen=True, kw_only=True)
class HostIssue:
    """Host seconds to issue one block's kernels, as ``plan calibrate`` measured them (a GPU runs
    what the host queued; a block whose kernels take the host longer to issue than the device to run
    waits for its host). 0: not measured, the host never binds."""

    forward_s: float = 0.0
    forward_backward_s: float = 0.0
    recomputed_s: float = 0.0  # forward and backward of a block that recomputes its forward
    split_s: float = 0.0  # forward, input and weight gradients of a block as ZB-H1 runs it

    def block_s(self, recompute: bool, split_backward: bool = False) -> tuple:
        """(forward, backward) host seconds per block. Recomputation re-issues the forward inside the
        backward; the split backward's forward is issued the plain block's share of its total (each
        measured apart, their ratios multiply where both apply, as in ``Device.block_slowdown``)."""
        if not self.forward_backward_s:
            return 0.0, 0.0
        total = self.forward_backward_s
        forward = self.forward_s
        if split_backward and self.split_s:
            forward *= self.split_s / self.forward_backward_s
            total = self.split_s
        if recompute and self.recomputed_s:
            total *= self.recomputed_s / self.forward_backward_s
        return forward, max(total - forward, 0.0)

    @classmethod
    def of_seconds(cls, seconds: dict) -> "HostIssue":
        """From a calibration's ``host_issue_s`` mapping (``HOST_ISSUE_KEYS``)."""
        return cls(**{f"{key}_s": float(seconds.get(key, 0.0)) for key in HOST_ISSUE_KEYS})
