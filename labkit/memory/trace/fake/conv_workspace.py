"""The workspace a CUDA convolution takes, as PyTorch runs it with cuDNN on an H200 (torch 2.11, cuDNN 9.19).

What PyTorch's source fixes (pytorch/pytorch, read through the lab's code index):

* ``aten/src/ATen/native/Convolution.cpp`` (``_select_conv_backend``, ``use_cudnn_depthwise``): a depthwise
  convolution (groups == input channels) in float32 or bfloat16 NCHW runs PyTorch's own kernel
  (``CudaDepthwise2d``), which takes no workspace; other convolutions run cuDNN.
* ``aten/src/ATen/native/cudnn/Conv_v8.cpp`` (``run_single_conv``, ``run_conv_plan``): with
  ``torch.backends.cudnn.benchmark`` False (the default) cuDNN's heuristics (``CUDNN_HEUR_MODE_INSTANT``)
  choose the engine; each call takes ``plan.getWorkspaceSize()`` bytes from the caching allocator right
  before the kernel and frees them when it returns (so they count in ``max_memory_allocated``), one
  allocation per pass: the forward; in ``convolution_backward`` first backward-data, then backward-filter.
  The plan is cached per shape, so every step takes the same sizes.

What the source does not fix is which engine the heuristics pick, hence the size. Measured on the H200
(``benchmarks/gpu/record_vision.py``, ``data/measurements/measure/conv_workspace__h200.json``: 29 2-D
geometries x batch 8/32/64 x fp32/bf16, the allocator's own trace of the blocks taken inside each call),
the sizes follow two mechanisms:

* **NHWC copies.** For every convolution other than a stride-1 1x1, the workspace is the bytes of the
  operands in NHWC layout (cuDNN's tensor-core engines work in NHWC and transpose the NCHW tensors
  PyTorch gives them): input + output + weight, channels padded to a multiple of 8 for 16-bit dtypes
  (e.g. bf16 3x3 64->64 at 56x56: 0.767 MiB per sample = 2 x 64 x 56 x 56 x 2 B; a bf16 16x16/16 patch
  embedding 3->768: 1.10 MiB per sample at batch 64 = 8 x 224^2 x 2 + 768 x 14^2 x 2, + the weight / 64).
  The same for backward-data (dy + dx + w); backward-filter takes this plus its split-K partial weight
  gradients (:func:`_split_k_partials`: up to 14 float32 copies of the weight gradient (13 in bf16)
  within 8 MiB, e.g. 7.9 MiB for a 3x3 128->128 in float32).
* **1x1 stride 1** is a GEMM on NCHW: forward and backward-data take none; backward-filter takes
  per-sample float32 partial weight gradients (batch x weight elements x 4 B) or the NHWC copies,
  whichever is smaller. At small spatial sizes (7x7 measured, e.g. ResNet's last stage) every pass takes
  the NHWC copies of input and output instead (:data:`SMALL_SPATIAL`).

In situ: one steady step of ``tv-resnet50-b128-amp-bf16`` (a reference case) traced by the allocator on the
H200 (``record_vision.py --part trace``) shows these blocks, in this order, inside its convolutions (e.g.
294.05 MiB in the stem, 98.07 MiB in each 3x3 of the first stage, 25.63 MiB at 14x14), as the rule gives
them; and at batch 96-256 (``--part batch``) the sizes keep scaling with the batch as the rule says.

:func:`conv_workspace_bytes` applies these, and two float32 refinements measured on both grids:

* a **float32 forward whose kernel does not overlap its strides** (1x1/2, 2x2/2) takes the input's copy and the
  weight only once the input's copy is 64 MiB or more (:data:`FP32_STRIDED_INPUT_ONLY`; e.g. 392 MiB for a
  1x1/2 256->512 at 56x56, batch 128, where the copies of both would be 589);
* a **float32 stem's weight gradient** (3 input channels) copies the input with its channels padded to 4 and
  takes a split-K buffer (:data:`FP32_STEM_WGRAD_PAD`, :data:`FP32_STEM_SPLIT_K_COPIES`): 985.8 MiB for
  ResNet's 7x7/2 stem at batch 256, more than its forward's 931 MiB, so the GPU maps a second segment for it.
  With both, ``tv-resnet18-b256-fp32``'s reserved moves from -14.5% to -0.3%.

A **float32 stem's input gradient** (3 input channels or fewer, NCHW) takes none, whatever its filter: 26 of the 27
float32 backward-data passes of stems the grids measured (the 7x7/2, 3x3/2 and 3x3/1 stems, the 4x4/4 and 16x16/16
patchifies, R3D-18's 3x7x7 and R(2+1)D's 1x7x7 stems, batch 8 to 256) took no block; the 16x16/16 patch embedding at
batch 8 took its copies (11.4 MiB). In bf16 the same passes take the NHWC copies, as the rule gives them. Autograd asks
for this pass only where the input requires a gradient: Wav2Vec2's feature encoder sets ``requires_grad`` on the
waveform, so its 1-channel stem runs it.

A stem with a small filter (3x3/2, 4x4/4) takes none in its forward, nor in float32 for its weight gradient
(:data:`SMALL_STEM_TAPS`; RegNet's, EfficientNet's and MobileNet's 3x3/2 stems, ConvNeXt's and Swin's 4x4/4
patchify). Checked against all 522 measured passes: 466 within 10% (or 0.6 MiB; 456 before the float32 stems' input
gradients above), and 128 of the 144 at batch 96-256 (122 before); the backward-filter passes of both grids within
1%: float32 86 of 111 (43 without the split-K partials), bf16 72 of 111 (65 without). Known misses (engines the
heuristics pick otherwise): 3x3 convolutions at 7x7 (larger engines' workspaces) and the split-K misses listed at
:func:`_split_k_partials`. The workspaces are transient: on the torchvision corpus they leave the predicted peaks
where they were (within 0.1%) and move the replayed reserved bytes. In the recorded allocation streams of a
ResNet-50 step at batch 128 (``data/measurements/measure/alloc_stream/stream__tv-resnet50-b128-*__warm``), 60 of the
77 backward workspace blocks in float32 are this rule's within 0.3 MiB (40 without the split-K partials), 54 of 78
in amp-bf16 (42 without); the reference cases' predicted reserved peaks move from -7.4% to +0.2% (fp32) and from
-10.6% to about -4% (amp-bf16).

**Channels-last** (ConvNeXt after its stem: its LayerNorm permutes leave every activation NHWC), measured on
the same grid in channels-last memory (``conv_workspace_channels_last__h200.json``, ``record_vision.py --part
cl``): depthwise convolutions run cuDNN's NHWC kernels, see :func:`_channels_last_depthwise` (ConvNeXt-tiny
fp32's reserved: -7.4% -> 0.0% held-out); dense ones take at most 17 MB for most geometries and are assumed
to take none.

**Transposed convolutions** follow from PyTorch's source, not from a measurement: ``ConvShared.cpp``
(``cudnn_convolution_transpose``, ``cudnn_convolution_transpose_backward_input``,
``cudnn_convolution_transpose_backward_weight``) runs a transposed convolution's forward as cuDNN's
backward-data of the convolution it transposes (its input in the role of that convolution's output
gradient, its output in the role of the input gradient), its input gradient as that convolution's forward
on the output gradient, and its weight gradient as that convolution's backward-filter with input and output
gradient swapped; the weight tensor is the same. :func:`conv_workspace_bytes` sizes each pass as the pass it
runs (:data:`TRANSPOSED_PASS`). Measured since (a UNet's 2x2/2 ``ConvTranspose2d`` at four widths and a 3x3 at
256x256, batch 8 and 16, float32 and bf16, ``conv_workspace_3d_transposed__h200.json``): 53 of 60 passes within
10% (or 0.6 MiB), 43 to the kilobyte; the input gradients of the float32 2x2/2 at 128 and 256 channels take the
output's copy too (the strided-forward refinement above leaves it out: 32-64 MiB less).

**3-D convolutions** run the same path: ``ConvParams::use_cudnn`` (``aten/src/ATen/native/Convolution.cpp``) has
no condition on the number of dimensions (NNPACK's has: ``input.ndimension() == 4``), so a 5-D input goes to
``cudnn_convolution`` and ``Conv_v8.cpp``'s ``run_single_conv`` as a 4-D one does, and cuDNN's engines copy the
operands to NDHWC as they copy 2-D ones to NHWC. Measured on the H200 (``record_handmade.py --part conv``,
``conv_workspace_3d_transposed__h200.json``: R3D-18's seven convolution geometries at batch 8 and 16, float32 and
bf16, 84 passes): with the NDHWC copies (input + output + weight) the rule is within 10% (or 0.6 MiB) in 76 of
the 84 passes, 57 of them to the kilobyte (with the float32 stride-1 forward below); the split-K buffer of the
weight gradient is 4 float32 copies of it where 2 or more fit in :data:`SPLIT_K_CAP` (:data:`SPLIT_K_COPIES_3D`),
none otherwise. Known misses: the 3-channel stem in bf16 takes no forward
workspace, its float32 weight gradient 10 MiB more than the rule, and the split-K buffers of the 3x3x3 256->256
at batch 16 in bf16 and of the 3x3x3 512->512 in float32 (4.5-6.75 MiB, none in the rule). R3D-18
(``tv-r3d_18-b16-*``): predicted peak -4.2% -> -0.2% (float32, reference), -3.4% -> -0.1% (amp-bf16, held-out);
reserved -20% -> +2.4% and -17% -> +2.3%. R(2+1)D's float32 1x7x7/2 stem (45 channels) takes no forward workspace
(the rule: its NDHWC copies) and 8% more than the rule for its weight gradient; its bf16 passes are the rule's.

**A float32 1x1 from at most 64 channels to an odd number** (a segmentation head's 21 classes) takes, for its weight
gradient, the NHWC copies of its input and of its output with the channels padded to 4 (as a float32 stem pads its
input's), not the per-sample partials: the reference UNet's classifier (1x1 64->21 at 512x512, batch 8, float32)
took 704.73 MiB there in its cold H200 stream (``alloc_stream/stream__hand-unet-b8-s512-fp32__cold.json.gz``; the
rule: 704.0; padded to 22 it would be 688), and no workspace forward or for its input gradient. Both UNet fp32 cases
(``hand-unet-b8-s512-fp32``, reference, and ``hand-unet-b16-s256-fp32``, held out): peak -2.9% and -2.8% -> 0.0%,
reserved -7.5% and -7.2% -> -0.2% and 0.0%. Even counts keep the partials: with the rule applied to every count not
a multiple of 4, ShuffleNet's 58-channel 1x1s would move its recorded reserved (reference
``tv-shufflenet_v2_x1_0-b256-fp32``, -0.9%) to +4.3%. Of the odd counts only 21 is measured. Measured since
(``conv_workspace_rules__h200.json``, ``record_handmade.py --part conv3``, batch 16 and 64): 64->21 at 256x256 and
64->19 at 128x128 take the copies at batch 16 (352.7 and 84.6 MiB; the rule 352.0 and 84.0) and the partials at
batch 64 (the rule: the copies); 256->21 at 64x64 takes the partials at both (so the rule stops at 64 input
channels); 58 output channels take the partials at both: the rule is within 10% on 28 of 30 float32 1x1 passes (26
before these refinements).

**Float32 3-D forwards at stride 1** take the input's NDHWC copy and the weight only, not the output's, once the
input's copy is :data:`FP32_STRIDED_INPUT_ONLY` or more, as the non-overlapping strided forwards above
(``conv_workspace_3d_transposed__h200.json`` and ``conv_workspace_more__h200.json``, ``record_handmade.py --part
conv2``: R3D-18's 3x3x3 64->64 at 16x56x56 at batch 8 and 16 (98 and 196 MiB inputs), R(2+1)D's factored 1x3x3
64->144 and 3x1x1 144->64 at 16x56x56 at batch 8, 16 and 128, all to the kilobyte; the 3x3x3 128->128 at 8x28x28,
whose input is 49 MiB at batch 16, takes both). 2-D stride-1 forwards take both at any size (a UNet's 3x3 at 256x256:
384 MiB at batch 8). MC3-18 (its layers 2-4 are 1x3x3 convolutions, ``tv-mc3_18-b16-fp32``): reserved -15.1% ->
-0.6%.

**Grouped convolutions** (RegNet's, 24 channels per group) take NHWC copies whose every group has its channels
padded to a power of two (24 -> 32: 4/3 of the unpadded copies). In RegNet-Y 1.6GF's cold allocation stream at batch
128 in float32 (``alloc_stream/stream__tv-regnet_y_1_6gf-b128-fp32__cold.json.gz``) a block of the padded size is
taken for the forward and the input gradient of each of its eight grouped geometries (one of the unpadded size for 4
of the 8, counting blocks of the same size in other passes); for the weight gradients the padded size appears for 3
of 8, the unpadded one for 4. The larger forward workspaces leave larger segments, which the backward reuses: the
predicted reserved bytes move from +9.5% to +2.1% (``tv-regnet_y_1_6gf-b128-fp32``). On the grid
(``conv_workspace_more__h200.json``, three RegNet geometries at batch 8, 16 and 128) the heuristics pick the padded
engine for half the forward and backward-data passes (9 of 18 each), mostly at batch 16 and more, and the unpadded
one for most weight gradients, so the rule is within 10% on 21 of 54 grid passes (29 without the padding): an engine
choice the source does not fix. ResNeXt's 4 or 8 channels per group are powers of two and unpadded, as measured
(``grouped3x3-g32-256-28``). Measured since at 8, 16, 24 and 48 channels per group
(``conv_workspace_rules__h200.json``, batch 16 and 64): 8 and 16 (powers of two) unpadded in every pass, 24 and 48
padded in some passes and not in others, as above; the rule is within 10% on 23 of 36 float32 and 30 of 36 bf16
passes. A float32 2-D **strided 1x1 with fewer than 64 input channels** (:data:`STRIDED_1X1_MIN_CHANNELS`: RegNet's
first two shortcuts) takes none in any pass in the same stream, and at 64 none forward or for its input gradient;
bf16 ones take their copies (the rule: within 10% on 20 of 24 float32 and 19 of 24 bf16 strided 1x1 passes of the
new grid, 16 and 14 before).

**1-D convolutions** run as 2-D ones of height 1: ``aten/src/ATen/native/Convolution.cpp`` (``_convolution``, under
the comment "Expand 1d -> 2d": ``params.view1d_as_2d()``, ``view4d``; read through the lab's code index) views an (N,
C, L) input as (N, C, 1, L) and its (O, I, K) weight as (O, I, 1, K), with stride 1, padding 0 and dilation 1 in the
new height, before choosing a backend; so cuDNN sees a 2-D problem and :func:`conv_workspace_bytes` sizes it as one
(:func:`_as_2d`). Measured since on a 1-D grid predicted before it ran (``record_handmade.py --part conv1d``,
``conv_workspace_1d__h200.json``: 19 geometries at batch 8 and 64, float32 and bf16, 6 of them held out), with three
refinements fitted on the 13 reference geometries: a float32 forward from at most
:data:`FP32_1D_INPUT_ONLY_MAX_CHANNELS` channels takes the input's copy and the weight only once the input's copy is
:data:`FP32_STRIDED_INPUT_ONLY` or more, whatever its stride (a 2-D one of the same shape would take both); a 16-bit
weight gradient takes no split-K buffer where fewer than :data:`SPLIT_K_MIN_COPIES_16BIT` copies fit; a 1-D stem's
16-bit forward takes its NHWC copies (2-D 3x3/2 and 4x4/4 stems take none). Within 10% (or 0.6 MiB): reference 62 of
78 float32 and 64 of 78 bf16 passes, held-out 34 and 35 of 36 (predicted before: 57, 62, 29, 35). In situ (the
reference cases' H200 streams, ``alloc_stream/stream__hand-conv1d-audio-*`` and ``stream__wav2vec2-*``): the audio
net's ConvTranspose1d forwards take their NHWC copies (642 MiB for the last), its strided forwards and their
transposes' input gradients the input's copy (``hand-conv1d-audio-b64-s32768-fp32``: reserved -20.8% -> -0.2%),
Wav2Vec2's feature encoder its 754 and 760 MiB (``wav2vec2-base-ctc-b8-s160000-fp32``: -19.9% -> +1.4%). Its float32
1x1 head to one channel at batch 64 takes the per-sample partials for its weight gradient, as the grid's 2-D 1x1s to
21 and 19 channels do at batch 64 (:data:`ODD_1X1_PARTIALS_FROM_BATCH`). Known misses: some float32 forwards from
16-32 MiB inputs (64 and 128 channels) take the input's copy only; bf16 input gradients of 64-channel convolutions at
stride 4 (and so the forwards of ConvTranspose1d to 64 channels) take none; the 64->1 head's bf16 forward takes its
copies (288 MiB) at batch 64; Wav2Vec2's grouped positional convolution (kernel 128, 16 groups) takes from none to 1.2
times the rule's.

**5x5 convolutions** (``record_handmade.py --part conv5``, ``conv_workspace_5x5__h200.json``: six 5x5 geometries with
Inception-v3's 3x3, 1x7 and 7x1 ones at batch 16 and 64): forwards and bf16 input gradients take the NHWC copies as the
rule gives them (17 and 18 of 18 float32 and bf16 forwards within 10%); float32 input gradients and weight gradients
take other engines' sizes at about half the points. Inception-v3's 5x5 48->64 at 35x35, batch 64, float32, takes 250
MiB for its weight gradient (the rule: 38) and 72 MiB for its input gradient (34): an engine the heuristics take for
that problem alone, not modelled (``tv-inception_v3-b64-fp32``'s reserved stays -6.2%; with the H200's sizes for its
passes, ``benchmarks/conv_stream_diff.py --substitute``, +0.05%).

**Per-sample weight gradients** (``torch.func``: ``vmap(grad(loss))`` over a batch of B samples, each run as a batch
of one) reach cuDNN as a grouped convolution of batch 1: functorch's batch rule for a weight gradient whose input and
output gradient both carry the vmapped dimension folds it into the channels and multiplies the groups by B
(``aten/src/ATen/functorch/BatchRulesConvolution.cpp``, ``convolution_backward_weight_batch_rule``: "BNO, BNI ->
N(BO), N(BI) -> (BO)I", ``groups * batch_size``). On the H200 those passes take no workspace of note (B = 512 in
``data/scripts/users2/per_sample_grads.py``'s allocator history, ``memory_trace__per_sample_grads.json``: 41 KB for
512 groups of 192->384 at 8x8, 7.3 MiB for 96->192 at 16x16, none above 2 KB for 3->96 at 32x32), where the grouped
rule's NHWC copies would be the per-sample weight gradients' size again (1.8 GB for the first):
:data:`GROUPED_WGRAD_BATCH_1` (that script's peak from +8.69% to the byte, reserved from -1.73% to the byte). Their
input gradients are ordinary convolutions of batch B.

Not measured, assumed as stated in :data:`ASSUMPTIONS`: fp16 depthwise in NCHW, ``cudnn.benchmark = True``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

_HALF = (torch.float16, torch.bfloat16)

ASSUMPTIONS = {
    "other": "cuDNN convolution workspace for a convolution of more than 3 spatial dimensions: assumed none",
    "channels_last": "cuDNN convolution workspace for a dense channels-last convolution: not modelled, assumed "
                     "none (measured on the H200 at most 17 MB for most geometries; the channels-last stem and patchify "
                     "take several times their input)",
    "channels_last_dw": "cuDNN workspace of a float32 channels-last depthwise convolution's weight gradient other "
                        "than 7x7 at 28x28 or larger: assumed none (measured on the H200: at most 2.2 MB)",
}


# a stem (3 input channels) with at most this many filter taps (3x3, 4x4) takes no workspace in its forward, nor
# in float32 for its weight gradient (measured on the H200: the 3x3/2 stem and the 4x4/4 patchify at batch 8-64,
# float32 and bf16, but for the patchify's float32 weight gradient at batch 8, 16.6 MB); 7x7 and 16x16 filters
# take the NHWC copies
SMALL_STEM_TAPS = 16

# a float32 stem's weight gradient (3 input channels): the input's NHWC copy has its channels padded to 4 (4 x 4 B:
# 16 bytes per pixel, as bf16's 8 x 2 B), and a split-K buffer of this many float32 copies of the padded weight
# gradient, at most SPLIT_K_CAP. Measured on the H200: one float32 plane per sample above the unpadded copy for the
# 7x7/2 stem at batch 32-256, R3D-18's 3x7x7 stem at 8 and 16 and the 16x16/16 patch embedding at 64-256; the rest
# 6.03 MB for the 7x7/2 stem at every batch from 32 to 256 (120.25 copies of 64 x 4 x 7 x 7 x 4 B), 18.56 MB in
# 3-D (the rule: 8 MiB), 0.79 MB for the patch embedding (the rule: 8 MiB)
FP32_STEM_WGRAD_PAD = 4
FP32_STEM_SPLIT_K_COPIES = 120

# a float32 forward whose kernel does not overlap its strides (1x1/2, 2x2/2, 1x1x1/2), or a float32 3-D forward at
# stride 1, takes the input's NHWC copy and the weight only, not the output's, once the input's copy is this large
# (3-D: see the module docstring; measured on the H200: 1x1/2
# 256->512 at 56x56 from batch 32, 2x2/2 96->96 from 64 (73.5 MiB; 36.8 MiB at 32 takes the output's too),
# R3D-18's 1x1x1/2 downsample at 8 and 16; 2x2/2 384->384 at 14x14 takes the output's at 18.4 MiB)
FP32_STRIDED_INPUT_ONLY = 64 * 1024 * 1024

# a float32 1-D convolution's forward (a 2-D one of height 1) from at most this many input channels takes the input's
# copy and the weight only, not the output's, once the input's copy is FP32_STRIDED_INPUT_ONLY or more, overlapping
# strides or not (conv_workspace_1d__h200.json, record_handmade.py --part conv1d: 64 to 256 input channels, stride 1
# to 4, kernels 3 to 8; 512 channels at kernel 3 take both; 2-D stride-1 and overlapping strided forwards take both)
FP32_1D_INPUT_ONLY_MAX_CHANNELS = 256

# a float32 2-D strided 1x1 convolution (a downsample shortcut) with fewer input channels than this takes no
# workspace in any pass, and with this many none forward or for its input gradient (in situ on the H200, RegNet-Y
# 1.6GF's cold stream at batch 128: the 1x1/2 32->48 and 48->120 shortcuts take none, 120->336 and 336->888 the NHWC
# copies; conv_workspace_rules__h200.json at batch 16 and 64: 32->64 and 48->96 none (but 32->64's weight gradient at
# batch 16, 37.7 MiB), 64->128 none forward or for the input gradient and its copies for the weight gradient, 96->192
# its copies forward; the grid's 1x1/2 256->512 takes them in every pass). bf16 takes the copies at these widths.
STRIDED_1X1_MIN_CHANNELS = 64

# a float32 stride-1 1x1 from at most this many input channels to an odd number of output channels copies both to NHWC
# for its weight gradient (the UNet's 64->21 in its stream, 64->21 and 64->19 at batch 16 in conv_workspace_rules;
# 256->21 keeps the per-sample partials: see the module docstring)
ODD_1X1_MAX_CHANNELS = 64
# ... at a batch below this: at batch 64 the same 1x1s (64->21 at 256x256, 64->19 at 128x128, conv_workspace_rules) and
# the audio net's 1-D 64->1 head (hand-conv1d-audio-b64-s32768-fp32: its recorded peak has no room for 544 MiB of
# copies) take the per-sample partials; batch 8 and 16 take the copies, 17-63 is not measured
ODD_1X1_PARTIALS_FROM_BATCH = 64

# a grouped convolution's weight gradient at this batch (functorch's per-sample gradients: see the module docstring)
# takes no workspace (measured on the H200 at 512 groups: 41 KB, 7.3 MiB and under 2 KB for its three convolutions)
GROUPED_WGRAD_BATCH_1 = 1

# a 1x1 stride-1 convolution at this many output pixels or fewer takes the NHWC copies of input and output
# in every pass (measured at 7x7; 14x14 and larger take none / the partials): the heuristics' boundary lies
# between 49 and 196 pixels, taken at the measured point
SMALL_SPATIAL = 49


def _round(c: int, m: int) -> int:
    return -(-c // m) * m


def _as_2d(shape: Sequence[int]) -> tuple[int, ...]:
    """A 1-D convolution's (N, C, L) shape as the 2-D (N, C, 1, L) that ``view4d`` gives cuDNN."""
    return (shape[0], shape[1], 1, *shape[2:])


def _height_1(x_shape: Sequence[int], w_shape: Sequence[int]) -> bool:
    """A 2-D convolution of height 1 with a filter of height 1: what a 1-D one becomes (:func:`_as_2d`)."""
    return len(x_shape) == 4 and x_shape[2] == 1 and w_shape[2] == 1


def _pow2(c: int) -> int:
    return 1 << (c - 1).bit_length()


# a float32 7x7 channels-last depthwise weight gradient at 28x28 or larger runs cuDNN's implicit-GEMM wgrad
# kernel, whose workspace is 8 float32 partials per input element plus a fixed part (measured on the H200:
# 9.94 MB at 96 x 56 x 56, 10.24 MB at 192 x 28 x 28 in ConvNeXt-tiny's stream; taken as 10 MiB)
CL_DW7_FIXED = 10 * 1024 * 1024


def _channels_last_depthwise(pass_: str, x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int],
                             dtype: torch.dtype) -> tuple[int, str | None]:
    """cuDNN's NHWC depthwise kernels (``conv_workspace_channels_last.json``, record_vision.py --part cl): no
    workspace forward or for the input gradient; the weight gradient takes, in fp16/bf16, a float32 partial
    per sample, filter tap and channel (channels padded to 32: N x ceil32(C) x K^2 x 32 B, exact on all 20
    measured rows), and in float32 none but for 7x7 filters at 28x28 or larger (the implicit-GEMM kernel
    ConvNeXt's first two stages run: N x C x H x W x 32 B + :data:`CL_DW7_FIXED`)."""
    if pass_ != "backward_filter":
        return 0, None
    n, c = x_shape[0], x_shape[1]
    taps = math.prod(w_shape[2:])
    if dtype in _HALF:
        return n * _round(c, 32) * taps * 32, None
    if taps == 49 and min(x_shape[2:]) >= 28:
        return n * c * math.prod(x_shape[2:]) * 32 + CL_DW7_FIXED, None
    return 0, ASSUMPTIONS["channels_last_dw"]


# the backward-filter's split-K partials on the NHWC engines (see _split_k_partials): per dtype, the most
# float32 copies of the weight gradient, and the fewest output pixels over the batch that take them
SPLIT_K_COPIES = {torch.float32: 14, torch.bfloat16: 13, torch.float16: 13}
SPLIT_K_MIN_PIXELS = {torch.float32: 64 * 7 * 7, torch.bfloat16: 8 * 56 * 56, torch.float16: 8 * 56 * 56}
SPLIT_K_CAP = 8 * 1024 * 1024
# 16-bit: none where fewer than this many copies fit the cap (conv_workspace_1d__h200.json: the 3-tap 512->512's weight
# gradient, 3 MiB per copy, takes none in bf16 at every size measured where float32 takes 2 copies; 2-D: 3 copies of a
# 3x3 256->256's, 2.25 MiB each, taken)
SPLIT_K_MIN_COPIES_16BIT = 3
# 3-D (NDHWC) convolutions: at most 4 copies, and none where fewer than 2 fit the cap (see _split_k_partials)
SPLIT_K_COPIES_3D = 4


def _split_k_partials(pass_: str, x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int],
                      dtype: torch.dtype) -> int:
    """The backward-filter's split-K buffer on cuDNN's NHWC engines: the reduction over batch x output pixels
    is cut into slices, each writing a float32 copy of the weight gradient, as many as fit
    :data:`SPLIT_K_CAP` up to :data:`SPLIT_K_COPIES` (14 in float32, 13 in bf16), once the batch holds at
    least :data:`SPLIT_K_MIN_PIXELS` output pixels (3136 in float32, 25088 in bf16).

    Measured on the H200 (both grids and the ResNet-50 b128 streams, fp32 and amp-bf16): float32 takes 14
    copies of a 3x3 64->64's and a 3x3 128->128's weight gradient at every batch from 32 to 256, 3 of a
    3x3 256->256's (6.75 MiB), 8 MiB where one copy is larger than 8 MiB (8.25 measured for 3x3 512->512),
    none for a 3x3 512->512 at 7x7 at batch 8; bf16 takes 13 (1.83 MiB for 3x3 64->64 at every batch,
    7.31 MiB for 3x3 128->128 at batch 96 and more in the grid and in ResNet-50's stream, 6.75 MiB for
    3x3 256->256 at 14x14 there). Known misses: bf16 takes 4 copies of 3x3 128->128's at 25088-50176
    pixels, 0.5-3 MiB for strided 1x1 and 2x2 and for copies over 8 MiB (none in the rule); float16 is
    not measured and taken as bf16."""
    if pass_ != "backward_filter" or dtype not in SPLIT_K_COPIES or x_shape[1] <= 3:
        return 0
    w32 = math.prod(w_shape) * 4
    if len(x_shape) == 5:
        copies = min(SPLIT_K_COPIES_3D, SPLIT_K_CAP // w32)
        return copies * w32 if copies >= 2 else 0
    if x_shape[0] * math.prod(y_shape[2:]) < SPLIT_K_MIN_PIXELS[dtype]:
        return 0
    copies = min(SPLIT_K_COPIES[dtype], SPLIT_K_CAP // w32)
    if copies == 0:
        return SPLIT_K_CAP if dtype == torch.float32 else 0
    if dtype in _HALF and copies < SPLIT_K_MIN_COPIES_16BIT:
        return 0
    return copies * w32


def conv_workspace_bytes(pass_: str, x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int],
                         stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int,
                         dtype: torch.dtype, *, transposed: bool = False,
                         channels_last: bool = False) -> tuple[int, str | None]:
    """Workspace bytes of one convolution pass (``forward``, ``backward_data`` or ``backward_filter``) and
    the assumption made, if any (see the module docstring)."""
    if pass_ not in ("forward", "backward_data", "backward_filter"):
        raise ValueError(f"pass_ {pass_!r}: expected forward, backward_data or backward_filter")
    if len(x_shape) == 3:
        # a 1-D convolution runs as a 2-D one of height 1 (see the module docstring: ``view1d_as_2d``)
        return conv_workspace_bytes(pass_, _as_2d(x_shape), _as_2d(w_shape), _as_2d(y_shape), (1, *stride),
                                    (0, *padding), (1, *dilation), groups, dtype, transposed=transposed,
                                    channels_last=channels_last)
    if transposed:
        # cuDNN runs a transposed convolution as the passes of the convolution it transposes (see the module doc)
        return conv_workspace_bytes(TRANSPOSED_PASS[pass_], y_shape, w_shape, x_shape, stride, padding, dilation,
                                    groups, dtype, channels_last=channels_last)
    cin = x_shape[1]
    if groups == cin and groups > 1 and dtype != torch.float16 and not channels_last:
        return 0, None                                   # PyTorch's depthwise kernel, not cuDNN
    if pass_ == "backward_filter" and groups > 1 and x_shape[0] == GROUPED_WGRAD_BATCH_1:
        return 0, None                                   # per-sample weight gradients (torch.func): none of note
    if len(x_shape) not in (4, 5):
        return 0, ASSUMPTIONS["other"]
    if channels_last and groups == cin and groups > 1:
        return _channels_last_depthwise(pass_, x_shape, w_shape, y_shape, dtype)
    if channels_last:
        return 0, ASSUMPTIONS["channels_last"]
    if (dtype == torch.float32 and len(x_shape) == 4 and all(k == 1 for k in w_shape[2:])
            and any(st > 1 for st in stride) and not any(padding)
            and (cin < STRIDED_1X1_MIN_CHANNELS or (cin == STRIDED_1X1_MIN_CHANNELS and pass_ != "backward_filter"))):
        return 0, None                                   # a narrow float32 strided 1x1: a kernel without workspace
    if cin <= 3 and math.prod(w_shape[2:]) <= SMALL_STEM_TAPS and (
            (pass_ == "forward" and (dtype == torch.float32 or not _height_1(x_shape, w_shape)))
            or (pass_ == "backward_filter" and dtype == torch.float32)):
        return 0, None                                   # a small-filter stem: a kernel without workspace
    if cin <= 3 and pass_ == "backward_data" and dtype == torch.float32:
        return 0, None                                   # a float32 stem's input gradient: a kernel without workspace
    es = torch.empty((), dtype=dtype).element_size()
    pad = 8 if dtype in _HALF else 1
    # float32 weight gradients of a 3-channel input (a stem) copy the input with its channels padded to 4
    xpad = FP32_STEM_WGRAD_PAD if (pass_ == "backward_filter" and dtype == torch.float32 and cin <= 3) else pad
    n, cout = x_shape[0], w_shape[0]
    cin_c, cout_c, wcin = cin, cout, w_shape[1]
    if groups > 1:                                       # each group's channels padded to a power of two
        cin_c, cout_c, wcin = groups * _pow2(cin // groups), groups * _pow2(cout // groups), _pow2(wcin)
    nhwc = (n * _round(cin_c, xpad) * math.prod(x_shape[2:]) + n * _round(cout_c, pad) * math.prod(y_shape[2:])
            + cout * _round(wcin, pad) * math.prod(w_shape[2:])) * es
    pointwise = all(k == 1 for k in w_shape[2:]) and all(s == 1 for s in stride) and not any(padding)
    split_k = _split_k_partials(pass_, x_shape, w_shape, y_shape, dtype)
    if xpad == FP32_STEM_WGRAD_PAD and xpad != pad:
        split_k = min(FP32_STEM_SPLIT_K_COPIES * cout * _round(w_shape[1], xpad) * math.prod(w_shape[2:]) * 4,
                      SPLIT_K_CAP)
    input_only = (len(x_shape) == 5 and all(st == 1 for st in stride)) or (
        _height_1(x_shape, w_shape) and w_shape[3] > 1 and cin <= FP32_1D_INPUT_ONLY_MAX_CHANNELS) or (
        any(st > 1 for st in stride) and all(k <= st for k, st in zip(w_shape[2:], stride)) and not any(padding))
    if (pass_ == "forward" and dtype == torch.float32 and cin > 3 and input_only
            and n * cin * math.prod(x_shape[2:]) * es >= FP32_STRIDED_INPUT_ONLY):
        return (n * cin * math.prod(x_shape[2:]) + cout * w_shape[1] * math.prod(w_shape[2:])) * es, None
    if not pointwise:
        return nhwc + split_k, None
    if math.prod(y_shape[2:]) <= SMALL_SPATIAL:
        return nhwc - cout * _round(w_shape[1], pad) * math.prod(w_shape[2:]) * es + split_k, None
    if pass_ != "backward_filter":
        return 0, None
    if dtype == torch.float32 and cout % 2 and cin <= ODD_1X1_MAX_CHANNELS and n < ODD_1X1_PARTIALS_FROM_BATCH:
        # a float32 1x1 from at most 64 channels to an odd number (a segmentation head's 21 classes): its weight
        # gradient copies input and output to NHWC, the output's channels padded to 4 (see the module docstring)
        padded_out = _round(cout, FP32_STEM_WGRAD_PAD) * math.prod(y_shape[2:])
        return n * (cin * math.prod(x_shape[2:]) + padded_out) * es, None
    partials = n * math.prod(w_shape) * 4
    return min(partials, nhwc - cout * _round(w_shape[1], pad) * math.prod(w_shape[2:]) * es + split_k), None


# the pass of the ordinary convolution that a transposed convolution's pass runs (x and y swap roles)
TRANSPOSED_PASS = {"forward": "backward_data", "backward_data": "forward", "backward_filter": "backward_filter"}
