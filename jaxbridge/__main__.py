from ._info import main

main()
