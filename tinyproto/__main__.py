from tinyproto.cli import main

main()
