from pagedkv.cli import main

main()
