"""The model: model.py (tiny-bert and Auto* models, tokenizers, hub access, --max_seq_length capped at what
the model and tokenizer allow) and lora.py (LoRA adapters with peft, merged copies for the output directory).
What the model predicts per example is a task shape's (horovod_train/tasks)."""
