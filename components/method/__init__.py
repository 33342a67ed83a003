"""The method: models (open_clip towers and our tiny configs), one loss per objective, hard examples."""
