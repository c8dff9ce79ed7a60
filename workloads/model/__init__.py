"""Base model preparation: save the original model once as a safetensors folder with a manifest."""
