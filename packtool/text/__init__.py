"""Text to tokenized documents: ``packtool tokenize`` (:mod:`packtool.text.run`) with a tokenizer
loaded from a local file (:mod:`packtool.text.tokenizer`); the reading and writing of files is in
:mod:`packtool.formats.text`."""
