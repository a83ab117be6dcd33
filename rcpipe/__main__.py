from rcpipe.cli import main

main()
