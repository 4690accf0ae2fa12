"""`grpokit pretrain-vision`: pretrain a vision-language model's vision tower on labelled pictures.

LLaVA-style models are built from a vision encoder that already sees (CLIP's, or a ViT pretrained on
labelled pictures), a projector, and a language model. Where no pretrained encoder can be had (grpokit's
CPU machines reach no model hub; `smollm2-135m-vision`'s tower is random), this command gives the tower
that first stage: the tower's output for a picture (its patch features, what the projector receives) is
pooled by one learned query per label key, and a linear map per key classifies the picture (supervised
multi-task pretraining, as a ViT is pretrained on ImageNet). The heads are dropped after; the projector
stays as it was and learns in SFT (LLaVA's first stage: `model.vision.train: [projector]`).

Why labels and not captions: on shapes pictures a caption-word objective (multi-label cross-entropy
over the captions' words, CatLIP's form) learned colours in 100 steps of 64 pictures but not sides or
kinds by step 300, while one softmax per label on the tower's output learned sides by step 200 (2 CPU
cores; docs/results.md). Heads on the projector's output learned slower than on the tower's. A
contrastive (CLIP) objective needs a text encoder and large batches; it learned slower still here.

The pictures and labels come from an environment: each example's first image and a field of its task
data (`--labels_field`, key -> value; the shapes environment's `labels`: colour, kind, count, and side
where the shape is wholly in one half). Use pictures of their own seed, apart from the SFT, GRPO and eval
sets. The output is a full
model folder (weights and processor) that `model.model` names, so `grpokit sft` and `grpokit fit` start
from it (docs/vision.md, "A tower that sees"). The folder is written atomically at the end; a stopped
run leaves nothing and starts over.
"""
