"""Spatial fission: a region of convolutions, element-wise ops and a per-pixel loss runs in n
parts along the height of its images (NCHW dim 2), one after another, each part reading the
rows its outputs need (halos), so only one part's intermediates and kernel scratch are live at
a time.

    r = split_rows(g, order, nodes, n)          # a Rewrite; why_not_split_rows says why not

What a region may hold (why_not_split_rows refuses the rest, naming the node):
- aten.convolution (2-D, not transposed): output rows [a, b) read input rows
  [a*s - p, (b-1)*s - p + d*(k-1) + 1) (stride s, padding p, dilation d, kernel k along the
  height). Rows outside the image are the padding: a part at the border pads its slice with
  zeros itself (aten.constant_pad_nd) and the part's convolution pads the height by 0;
- element-wise ops (the registry's kind, not random, nothing written in place) on [N, C, H, W]
  tensors; an input of height 1, or of one element, is broadcast, not split;
- a softmax or log-softmax (and their backwards) along another dim than the rows, and a
  detach of an image: like element-wise ops;
- aten.nll_loss2d_forward / _backward (unweighted, reduction mean or sum), a per-pixel loss:
  part k sums the loss of its own rows (reduction sum) into the loss and their count into a
  total; a mean divides once after the last part (`<loss>_mean`). The backward runs per part
  on the whole count, which must not be made in the region (peakcut.fission.loss computes it
  up front from the targets, for a mean only); a region through the loss needs that first
  (a summed loss's backward still reads the forward's total weight: a region holds one of them);
- aten.convolution_backward (2-D, not transposed): a part takes the rows of grad_output it
  owns and the input rows they read (with halos, padded as above); its grad_input rows add
  into the whole gradient (rows two parts read get both parts' sums): where the parts' rows
  tile the image (overlapping only the previous part's: op_parts.tiles), part k copies the rows past
  the previous part's and adds only the overlap, into a gradient never zeroed (a zeroed
  gradient and whole-part adds cost U-Net's top convolution's backward at n = 4 +6.0 ms on
  the RTX 3090 profile, the copies +3.7 ms); its grad_weight and grad_bias add up over the
  parts. Its outputs are not read inside the region, except a pointwise backward's grad_input
  (kernel 1, stride 1, no padding along the height: its rows are exactly its grad_output
  rows', not partial sums), which a part reads as its own rows (a part needing more of them,
  a gradient's halo, is refused). A backward that makes only grad_input
  (after split_conv_grads) reads its input's shape, never its values, yet ATen makes the input
  contiguous first: its parts get a contiguous view of that shape on the input's storage
  (`<tensor>_rows<a>_<b>_shape_only`) instead of a row slice ATen would copy (paper U-Net++'s
  peak at n = 4: -5.1% instead of -3.0%, simulated).

Each tensor the region hands on (read outside it, or a program output) is preallocated whole
before the parts (the same tensor id, so its readers are untouched); of an output of a
convolution or an element-wise op, part k writes the rows it owns, [k*H//n, (k+1)*H//n). A
tensor made inside the region is computed in part k on the rows that its own rows and the
halos of its readers in the region need: halo rows are computed again in the next part (the
cost of a spatial split, priced by the simulator on the rewritten graph). Nodes of the part
are named `<node>_rows<a>_<b>`, slices with halos `<tensor>_rows<a>_<b>`, so the generated
program reads as the parts it runs (written out, not as a loop: the parts at the borders
differ from the inner ones).

Numbers: each output row is computed from the same input rows by the same op; what changes is
the summation order of the convolution's grad_input rows at part borders, of grad_weight and
grad_bias (summed over the parts), and of a loss's sum and pixel count (summed per part, then
added in the loss's dtype: in bfloat16 a few units of the last place from eager's), as in
batch fission.
Files:
- ops.py: what ops a region may hold, and their row geometry (Rows, Window, owned);
- region.py: which nodes form a region and why not (why_not_split_rows);
- halos.py: the rows each part computes of each tensor made in the region;
- parts.py: the builder of the parts (their nodes, the row slices they read);
- op_parts.py: part k of each kind of node (convolution, element-wise, loss, backward);
- split.py: split_rows, the region rewritten as its parts.
"""

from peakcut.transform.spatial.ops import (
    CONV,
    CONV_BACKWARD,
    NLL_BACKWARD,
    NLL_FORWARD,
    ROW_LOCAL_VIEWS,
    ROWS,
    Rows,
    is_pointwise,
    owned,
    reads_input_shape_only,
    split_inputs,
    why_not_node,
)
from peakcut.transform.spatial.region import why_not_split_rows
from peakcut.transform.spatial.split import split_rows

__all__ = ["CONV", "CONV_BACKWARD", "NLL_BACKWARD", "NLL_FORWARD", "ROW_LOCAL_VIEWS", "ROWS", "Rows",
           "is_pointwise", "owned", "reads_input_shape_only", "split_inputs", "split_rows", "why_not_node",
           "why_not_split_rows"]
