"""The subcommands of `jlearngene` (`jlearngene.cli`), one module each: `HELP` (the one line
`jlearngene --help` lists) and `main(argv) -> int`, imported only when its command runs."""
