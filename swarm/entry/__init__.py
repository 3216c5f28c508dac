"""The entry side (event loop): a request from prompt to tokens, through whatever pipeline serves it."""
